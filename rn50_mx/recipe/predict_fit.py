"""The time-to-train model's constants (rn50_mx.recipe.predict), written by
`bench/predict_ttt.py --write-fit` from bench/mlperf_resnet_results.csv: 242 results of rounds
v0.6-v4.0. Do not edit: rerun it."""
RULESET = '4.0.0'  # the RCPs the epochs come from (the newest with ResNet)
# images/s per GPU on one node: the median of the single-node results
IMG_PER_S = {'A10': 939,
 'A100': 3347,
 'A100-PCIe': 2935,
 'A30': 1591,
 'A40': 1344,
 'A5000': 1322,
 'AMD Radeon RX 7900 XTX': 767,
 'H100': 7030,
 'H100-PCIe': 4502,
 'H200': 7821,
 'L4': 733,
 'L40': 1999,
 'L40S': 2021,
 'V100': 1399,
 'V100-PCIe': 1361}
LATENCY = 0.004626  # seconds a step across nodes loses beyond b / v and the unhidden ring
PER_DOUBLING = 0.000000  # and more per doubling of the nodes (0: the data show no growth)
INIT_MINUTES = {'1 node': 0.68, '2-16 nodes': 0.97, 'more': 1.4}  # init_start to run_start, median per system size
# published / predicted, 10th and 90th percentile, leave-one-round-out, per system size
RATIO_INTERVAL = {'1 node': (0.956, 1.167), '2-16 nodes': (0.952, 1.25), 'more': (0.901, 1.424)}
