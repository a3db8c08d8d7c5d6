"""Hypothesis strategies for chat messages, shared by the API fuzz tests and the answer
cache's property tests."""

from __future__ import annotations

from hypothesis import strategies as st

# A plain turn of a conversation: a role and some text.
turn = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant"]), "content": st.text(max_size=120)}
)
# The user's turn a conversation ends on: never empty.
last_turn = st.fixed_dictionaries({"role": st.just("user"), "content": st.text(min_size=1)})
