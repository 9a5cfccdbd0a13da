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


def parts_tol(part_grads, n_terms: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Worst-case rounding of a gradient summed over ``n_terms`` per-token terms in some order,
    from its per-part gradients ``part_grads`` (each (numel,), the finest split the test can
    afford): n_terms * eps * the largest |entry| of any part (Higham eq. 4.4 with the terms
    bounded by that scale). Per element it would be too tight: inside a part the tokens' terms
    cancel (an entry of 1e-11 summed from terms of 0.1), which |g_part| cannot see."""
    scale = max(float(g.abs().max()) for g in part_grads)
    return torch.full_like(part_grads[0], n_terms * torch.finfo(dtype).eps * scale)


def assert_close_to(got: torch.Tensor, want: torch.Tensor, tol: torch.Tensor, what: str = "") -> None:
    """|got - want| <= tol element by element, naming the worst element."""
    excess = (got - want).abs() - tol
    i = int(excess.argmax())
    assert float(excess[i]) <= 0, (f"{what}: element {i} differs by {float((got - want)[i]):.3g}, "
                                   f"tolerance {float(tol[i]):.3g}")
