"""The generation benchmark's workload (bench/test_generation_bench.py), also timed by the studies that compare
against it (studies/timing/generation_attention.py, integration_cost.py): the prompt and the count of
teacher-forced generated tokens."""

PROMPT = ("Review: the acting is superb and the story keeps you guessing until the very last scene.\n"
          "Is this review positive or negative? Explain briefly.\nAnswer:")
NEW_TOKENS = 32
SHORT = "the film was great"  # the tiny model's position table is 64 long
