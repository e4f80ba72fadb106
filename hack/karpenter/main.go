// Command karpenter-kwok is the real Karpenter with its KWOK cloud provider, for gpuguard's
// tests only, with one change: the node repair policies of Karpenter's AWS provider
// (aws/karpenter-provider-aws, pkg/cloudprovider: AcceleratedHardwareReady False 10 min;
// NetworkingReady, KernelReady False 30 min) appended to the KWOK provider's own, so the
// tests see what Karpenter on EKS does with gpuguard's eks-named conditions. Their
// toleration comes from REPAIR_TOLERATION (a Go duration; default the AWS provider's).
package main

import (
	"os"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/log"

	kwok "sigs.k8s.io/karpenter/kwok/cloudprovider"
	"sigs.k8s.io/karpenter/pkg/cloudprovider"
	"sigs.k8s.io/karpenter/pkg/cloudprovider/overlay"
	"sigs.k8s.io/karpenter/pkg/controllers"
	"sigs.k8s.io/karpenter/pkg/controllers/state"
	"sigs.k8s.io/karpenter/pkg/operator"
)

// withAWSRepairs is the KWOK provider answering RepairPolicies as the AWS provider does.
type withAWSRepairs struct {
	*kwok.CloudProvider
	toleration map[corev1.NodeConditionType]time.Duration
}

func (p withAWSRepairs) RepairPolicies() []cloudprovider.RepairPolicy {
	policies := p.CloudProvider.RepairPolicies()
	for _, kind := range []corev1.NodeConditionType{"AcceleratedHardwareReady", "NetworkingReady", "KernelReady"} {
		policies = append(policies, cloudprovider.RepairPolicy{
			ConditionType:      kind,
			ConditionStatus:    corev1.ConditionFalse,
			TolerationDuration: p.toleration[kind],
		})
	}
	return policies
}

func tolerations() map[corev1.NodeConditionType]time.Duration {
	shipped := map[corev1.NodeConditionType]time.Duration{
		"AcceleratedHardwareReady": 10 * time.Minute,
		"NetworkingReady":          30 * time.Minute,
		"KernelReady":              30 * time.Minute,
	}
	if text := os.Getenv("REPAIR_TOLERATION"); text != "" {
		every, err := time.ParseDuration(text)
		if err != nil {
			panic("REPAIR_TOLERATION: " + err.Error())
		}
		for kind := range shipped {
			shipped[kind] = every
		}
	}
	return shipped
}

func main() {
	ctx, op := operator.NewOperator()
	instanceTypes, err := kwok.ConstructInstanceTypes(ctx)
	if err != nil {
		log.FromContext(ctx).Error(err, "failed constructing instance types")
	}
	provider := withAWSRepairs{kwok.NewCloudProvider(ctx, op.GetClient(), instanceTypes), tolerations()}
	decorated := overlay.Decorate(provider, op.GetClient(), op.InstanceTypeStore)
	cluster := state.NewCluster(op.Clock, op.GetClient(), decorated)
	op.WithControllers(ctx, controllers.NewControllers(
		ctx, op.Manager, op.Clock, op.GetClient(), op.EventRecorder,
		decorated, provider, cluster, op.InstanceTypeStore,
	)...).Start(ctx)
}
