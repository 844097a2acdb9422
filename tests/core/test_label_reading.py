"""LabelSpace.read: every row's prediction, probabilities and requested columns read at once equal what one row at a
time gives (softmax, top-k, argmax), ties for the top included."""

from __future__ import annotations

import tiny
import torch

from normx.core.labels import TOP_TOKENS, LabelSpace
from normx.models import HeadKind


def _one_row(labels: LabelSpace, logits: torch.Tensor, columns: list[int]):
    probs = logits.softmax(-1)
    shown = list(dict.fromkeys(probs.topk(TOP_TOKENS).indices.tolist() + columns))
    names = labels.tokenizer.convert_ids_to_tokens(shown)
    return int(logits.argmax()), {n: float(probs[i]) for n, i in zip(names, shown)}, [float(probs[c]) for c in columns]


def test_vocabulary_rows_read_at_once_equal_one_at_a_time():
    model, tokenizer = tiny.build("LlamaForCausalLM")
    labels = LabelSpace(HeadKind.CAUSAL_LM, model.config, tokenizer)
    torch.manual_seed(0)
    logits = torch.randn(6, len(tokenizer)) * 3
    logits[2, 7] = logits[2, 11] = logits[2].max() + 1  # a tie for the top: argmax takes the first column
    columns = [[5], [9, 3], [7], [11], [0], [len(tokenizer) - 1]]
    read = labels.read(logits, columns)
    for r in range(6):
        best, probabilities, wanted = _one_row(labels, logits[r], columns[r])
        assert read.best[r] == best and read.labels[r] == tokenizer.convert_ids_to_tokens(best)
        assert read.probabilities[r].keys() == probabilities.keys()
        for name, value in probabilities.items():
            assert abs(read.probabilities[r][name] - value) <= 1e-6 * max(value, 1e-30) + 1e-12
        assert all(abs(a - b) <= 1e-6 * b + 1e-12 for a, b in zip(read.wanted[r], wanted))
    assert read.best[2] == 7
    assert labels.prediction(logits[3], [11]) == (read.labels[3], read.probabilities[3])


def test_classification_and_regression_rows():
    model, tokenizer = tiny.build("BertForSequenceClassification")
    labels = LabelSpace(HeadKind.SEQUENCE_CLASSIFICATION, model.config, tokenizer)
    logits = torch.tensor([[0.1, 2.0, -1.0], [3.0, 0.0, 3.0]])
    read = labels.read(logits, [[0], [2]])
    assert read.labels == [labels.names[1], labels.names[0]] and read.best == [1, 0]
    probs = logits.softmax(-1)
    assert read.probabilities[0] == {labels.names[i]: float(probs[0, i]) for i in range(3)}
    assert read.wanted == [[float(probs[0, 0])], [float(probs[1, 2])]]
    given = labels.read(logits, [[0], [2]], best=logits.argmax(-1).tolist())  # the caller's argmax, ties included
    assert (given.labels, given.probabilities, given.best, given.wanted) == (read.labels, read.probabilities,
                                                                             read.best, read.wanted)


def test_rows_with_columns_of_different_lengths():
    model, tokenizer = tiny.build("LlamaForCausalLM")
    labels = LabelSpace(HeadKind.CAUSAL_LM, model.config, tokenizer)
    torch.manual_seed(1)
    logits = torch.randn(3, len(tokenizer))
    top = int(logits[0].argmax())
    columns = [[top], [], [4, 8, 15]]  # a column among the top tokens, none, three
    read = labels.read(logits, columns)
    assert [len(w) for w in read.wanted] == [1, 0, 3]
    assert len(read.probabilities[0]) == TOP_TOKENS and len(read.probabilities[1]) == TOP_TOKENS
    probs = logits.softmax(-1)
    assert all(abs(a - float(probs[2, c])) <= 1e-6 for a, c in zip(read.wanted[2], columns[2]))


def test_explain_reads_a_batch_of_predictions_at_once(monkeypatch):
    """``normx.explain`` reads every row's prediction of a batch in one go (one copy off the device, not one per
    text), and each equals the text explained alone."""
    import normx

    model, tokenizer = tiny.build("BertForSequenceClassification")
    texts = ["a fine film", "dull and long, the end was bad", "good"]
    alone = [normx.explain(model, tokenizer, text) for text in texts]
    reads = []
    original = LabelSpace.read
    monkeypatch.setattr(LabelSpace, "read", lambda self, logits, columns, best=None: reads.append(len(columns))
                        or original(self, logits, columns, best))
    together = normx.explain(model, tokenizer, texts, batch_size=8)
    assert reads == [3]
    for one, row in zip(alone, together):
        assert row.prediction == one.prediction and row.probabilities.keys() == one.probabilities.keys()
        assert all(abs(row.probabilities[k] - v) <= 1e-5 for k, v in one.probabilities.items())
