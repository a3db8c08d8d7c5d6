from __future__ import annotations

import numpy as np

from training.evaluation.logistic import Logistic


def test_logistic_ranks_by_the_informative_feature() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, 3))
    y = (x[:, 0] + 0.3 * rng.normal(size=400) > 0).astype(float)
    model = Logistic(l2=1.0).fit(x, y)
    p = model.predict(np.array([[2.0, 0.0, 0.0], [-2.0, 0.0, 0.0]]))
    assert p[0] > 0.9 > 0.1 > p[1]
    constant = Logistic().fit(x, np.ones(400)).predict(x[:5])
    assert np.all(constant > 0.99)
