"""The LLM router's RL pipeline on verl (the xRouter paper's setting): an outcome table as
verl's multi-turn dataset (``data``, no verl needed), the replayed downstream models as
verl tools (``tools``) and the cost-penalized reward as verl's reward function
(``reward``). Needs the ``verl`` extra; training itself needs GPUs (README.md here)."""
