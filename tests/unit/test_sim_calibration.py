"""The calibration scenarios against the figures their rates were fitted to: plumbing,
not the model (docs/simulator.md, "Calibration").

Each scenario's failure rate was set from the very figure its test compares with (Llama 3's
419 interruptions give 3.79 per 1,000 node-days; RSC-1's measured job MTTFs give its
unattributed surplus; 6.5 per 1,000 node-days is the 16,384-GPU projection's own input).
So a pass says the rates reach the jobs intact (sampling, placement, interruption
counting, hardware attribution, the scaling with job size); it is no evidence that the
model predicts anything. The figures no rate was fitted to are marked where they appear
(Llama 3's ETTR, RSC-1's second MTTF), and the out-of-sample check of the generator is
tests/unit/test_sim_trace_calibration.py (the StepFun trace).
"""

from __future__ import annotations

import pytest

from gpuguard.sim.run import simulate
from gpuguard.sim.scenario import build_scenario, bundled_scenario

# Kokolis et al. (HPCA 2025): job MTTF by job size on RSC-1; 16,384 GPUs is their
# projection from the hardware failure rate alone (6.5 per 1,000 node-days).
MTTF_8_GPUS_H = 47.7 * 24
MTTF_1024_GPUS_H = 7.9
MTTF_16384_GPUS_H = 1.8
# Llama 3 405B: 419 unexpected interruptions in 54 days on 16,384 H100.
LLAMA3_INTERRUPTIONS = 419


def test_llama3_run_sees_the_published_interruptions_and_keeps_ettr_above_90_percent():
    """Plumbing: 419 in 54 days on 2,048 nodes is where the default rate (3.79 per 1,000
    node-days) comes from. Not fitted: ETTR above 90 %, which turns on the scenario's
    job-side settings (platform-grade restarts and checkpoints, chosen from the literature,
    not to reach it): a consistency check, within a wide bound."""
    result = simulate(bundled_scenario("llama3-16k"), policies=("gpuguard",)).results["gpuguard"]
    assert result.interruptions == pytest.approx(LLAMA3_INTERRUPTIONS, rel=0.15)
    assert result.ettr > 0.90  # "> 90 % effective training time"


def test_job_mttf_for_8_and_1024_gpus_matches_meta_rsc1():
    """Plumbing: the scenario's unattributed surplus (16.25 per 1,000 node-days) was set so
    that one per-node rate sits between these two measured MTTFs. What a pass adds is that
    one rate explains both sizes, i.e. that interruptions scale with a job's nodes as the
    model assumes; the 8-GPU figure is the looser of the two."""
    result = simulate(bundled_scenario("meta-rsc1"), policies=("gpuguard",)).results["gpuguard"]
    assert result.job_mttf_h[1] == pytest.approx(MTTF_8_GPUS_H, rel=0.25)
    assert result.job_mttf_h[128] == pytest.approx(MTTF_1024_GPUS_H, rel=0.15)


def test_job_mttf_for_16384_gpus_matches_the_hardware_projection():
    """Plumbing: Kokolis projects 1.8 h from r_f = 6.5 per 1,000 node-days, the scenario's
    own hardware rate; a pass says hardware-attributed interruptions are counted as such on
    a 2,048-node job, not that the projection holds."""
    data = bundled_scenario("meta-rsc1").model_dump(by_alias=True)
    # The projection is of the drawn rate: no warm-up, in which the policy would first
    # replace the lemons that raise it.
    data.update(days=12, warmup_days=0)
    data["fleet"]["nodes"] = 2200
    data["jobs"]["mix"] = [{"nodes": 2048, "share": 1.0, "hours": [100000, 100000]}]
    # The projection is the hardware rate alone: no software interruptions to mask it.
    data["failures"]["unattributed_per_1000_node_days"] = 0
    result = simulate(build_scenario(data, "test"), policies=("gpuguard",)).results["gpuguard"]
    # Hardware-attributed interruptions only: the projection leaves software out.
    assert result.attributed_job_mttf_h[2048] == pytest.approx(MTTF_16384_GPUS_H, rel=0.2)
