"""Float tolerances that follow the magnitude of what is summed, not of the result.

A GRPO loss is a mean of per-token terms ratio * A that cancel to about 1e-6, so a tolerance
set on the result (abs=1e-7) sits at float32 rounding and fails on a CPU that sums in another
order (AVX-512 vs AVX2, a different micro-batch split). Recursive summation of n terms has a
worst-case rounding error of n * eps * sum_i |x_i| (Higham, Accuracy and Stability of Numerical
Algorithms, 2002, eq. 4.4); for a mean that is n * eps * mean_i |x_i|.
"""
import torch


def mean_tol(n_terms: int, mean_abs_term: float, dtype: torch.dtype = torch.float32) -> float:
    """Worst-case rounding error of the mean of n_terms terms whose mean magnitude is given."""
    if n_terms < 1 or not mean_abs_term >= 0:
        raise ValueError(f"need n_terms >= 1 and mean_abs_term >= 0, got {n_terms}, {mean_abs_term}")
    return n_terms * torch.finfo(dtype).eps * mean_abs_term
