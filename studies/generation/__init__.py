"""Generation studies: faithfulness, the held-out choice of settings, peers side by side."""
