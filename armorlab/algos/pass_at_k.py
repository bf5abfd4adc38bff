"""avg@n and pass@k of n sampled completions per problem (no I/O): the papers' held-out metrics."""

from __future__ import annotations


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem from n samples of which c are correct (Chen et al. 2021,
    arXiv 2107.03374, Eq. 1): 1 − C(n−c, k) / C(n, k), the chance that k of the n samples drawn
    without replacement hold a correct one; computed as 1 − Π_{i=n−c+1}^{n} (1 − k/i), which stays
    finite for large n. With k = n it is 1 when any sample is correct, else 0."""
    if not 0 < k <= n or not 0 <= c <= n:
        raise ValueError(f"pass@k needs 0 < k ≤ n and 0 ≤ c ≤ n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod
