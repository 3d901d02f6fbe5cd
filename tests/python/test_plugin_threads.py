"""Several Python threads dispatching to the same and different virtual devices at once."""

from __future__ import annotations

import threading

import jax
import jax.numpy as jnp
import numpy as np


def test_concurrent_dispatch_is_correct(npu_devices: list) -> None:
    step = jax.jit(lambda x, w: jnp.tanh(x @ w) + x)
    rng = np.random.default_rng(1)
    w = rng.standard_normal((32, 32)).astype(np.float32) * 0.1
    inputs = [rng.standard_normal((16, 32)).astype(np.float32) for _ in range(8)]
    expected = [np.tanh(x @ w) + x for x in inputs]
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            device = npu_devices[i % 2]  # two threads per device on devices 0 and 1 ...
            if i >= 4:
                device = npu_devices[i % len(npu_devices)]  # ... and the rest spread out
            wd = jax.device_put(w, device)
            x = jax.device_put(inputs[i], device)
            for _ in range(30):
                y = step(x, wd)
                assert y.devices() == {device}
                np.testing.assert_allclose(np.asarray(y), expected[i], rtol=1e-5, atol=1e-5)
                moved = jax.device_put(y, npu_devices[(i + 1) % len(npu_devices)])
                np.testing.assert_allclose(np.asarray(moved), expected[i], rtol=1e-5, atol=1e-5)
        except BaseException as e:  # noqa: BLE001 - reported on the main thread
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
