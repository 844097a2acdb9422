"""normx.core.verdicts: a check's verdict kept per model and key, for as long as the model lives, from threads."""

from __future__ import annotations

import gc
import threading

import torch

from normx.core.verdicts import Verdicts


def test_kept_per_model_and_key_while_the_model_lives():
    table, a, b = Verdicts(), torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    assert table.get(a, "float32") is None
    table.record(a, "float32", True)
    table.record(b, "float32", False)
    assert table.get(a, "float32") is True and table.get(b, "float32") is False and table.get(a, "bfloat16") is None
    del a
    gc.collect()
    assert len(table._table) == 1  # the dropped model's entries went with it


def test_threads_record_and_read_one_table():
    table, model = Verdicts(), torch.nn.Linear(2, 2)

    def work(i):
        for k in range(200):
            table.record(model, (i, k), k)
            assert table.get(model, (i, k)) == k

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(table.get(model, (i, k)) == k for i in range(4) for k in range(200))
