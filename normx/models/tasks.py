"""The tasks a model can be loaded for (``task=`` / ``--task``), each with the transformers auto class that loads
it. Light: no import of transformers or torch, so the command line can offer them at once."""

TASKS = {
    "sequence-classification": "AutoModelForSequenceClassification",
    "masked-lm": "AutoModelForMaskedLM",
    "causal-lm": "AutoModelForCausalLM",
}
