"""The base of every config section: frozen, and unknown keys refused."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    # An error's input value is the whole section as given, secrets included in the clear (a
    # pass-through table's password, kafka.sasl_password): validation errors never show it.
    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)
