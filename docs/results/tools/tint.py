"""Student t 95 % interval of a mean, for the results scripts that import it
(current-build/brennan2017, current-build/brennan2017-lowat, tunnel-shared/lowat,
design/paired-paths3-fresh):

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../tools"))
    from tint import tint
"""
import math
import statistics as st

# Two-sided 95 % quantiles of Student's t by degrees of freedom; beyond 30
# the normal's 1.96.
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
        11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093,
        20: 2.086, 21: 2.080, 22: 2.074, 23: 2.069, 24: 2.064, 25: 2.060, 26: 2.056, 27: 2.052, 28: 2.048,
        29: 2.045, 30: 2.042}


def tint(x):
    """(mean, low, high) of x with the Student t 95 % interval; NaN bounds for one value."""
    m = st.mean(x)
    if len(x) < 2:
        return m, float("nan"), float("nan")
    h = T975.get(len(x) - 1, 1.96) * st.stdev(x) / math.sqrt(len(x))
    return m, m - h, m + h
