"""A small L2-regularized logistic regression in numpy, for the escalation policy's selectors
and value models and the headroom analysis (tables of a few thousand rows: torch or
scikit-learn would be a heavy dependency for a few Newton steps)."""

from __future__ import annotations

import numpy as np


class Logistic:
    """L2-regularized logistic regression fitted by Newton steps on standardized features
    (numpy only; the tables are small). A constant label is predicted as that constant."""

    def __init__(self, l2: float = 1.0, iterations: int = 50) -> None:
        self.l2, self.iterations = l2, iterations
        self._beta = np.zeros(1)
        self._mu = np.zeros(0)
        self._sd = np.ones(0)

    def fit(self, x: np.ndarray, y: np.ndarray) -> Logistic:
        x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
        if x.ndim != 2 or len(x) != len(y) or len(y) == 0:
            raise ValueError("need a non-empty (n, d) feature matrix and n labels")
        self._mu, self._sd = x.mean(axis=0), x.std(axis=0)
        self._sd[self._sd < 1e-9] = 1.0
        z = np.hstack([(x - self._mu) / self._sd, np.ones((len(x), 1))])
        ridge = self.l2 * np.eye(z.shape[1])
        ridge[-1, -1] = 1e-6  # the intercept is not shrunk
        beta = np.zeros(z.shape[1])
        for _ in range(self.iterations):
            p = 1.0 / (1.0 + np.exp(-np.clip(z @ beta, -30, 30)))
            grad = z.T @ (p - y) + ridge @ beta
            hess = (z * (p * (1 - p))[:, None]).T @ z + ridge
            step = np.linalg.solve(hess, grad)
            beta -= step
            if np.abs(step).max() < 1e-8:
                break
        self._beta = beta
        return self

    def predict(self, x: np.ndarray) -> np.ndarray:
        x = np.atleast_2d(np.asarray(x, dtype=float))
        z = (x - self._mu) / self._sd
        return 1.0 / (1.0 + np.exp(-np.clip(z @ self._beta[:-1] + self._beta[-1], -30, 30)))
