"""GPUs judged under the load of real work: the verdicts running jobs write about their own
ranks (``verdict_check.py``), and busy GPUs compared with their siblings (``load_clocks.py``).
"""
