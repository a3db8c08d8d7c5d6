"""The LLM router's RL pipeline on verl (the xRouter paper's setting): an outcome table as
verl's dataset (``data``, no verl needed), the gateway's own loop and ``llm`` policy as
verl's agent loop (``agent_loop``), the cost-penalized reward of a trajectory (``reward``)
and the launch command (``launch``). The agent loop needs the ``verl`` extra; training
itself needs GPUs (README.md here)."""
