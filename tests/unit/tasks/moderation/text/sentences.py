"""Fixed sentences and a policy for the real-weights text tests (plainly violent, plainly scams,
plainly neutral; the neutral ones include violent and scam *words* used harmlessly)."""

from __future__ import annotations

from pathlib import Path

from worker.config import load_config
from worker.config.policies import PolicySettings

VIOLENT = ["I'm going to beat you until you bleed.",
           "The gunman shot three people dead in the street.",
           "He stabbed his neighbour repeatedly with a kitchen knife.",
           "We will kill every one of them tonight."]
SCAM = ["Congratulations! You won a $1000 gift card, click here and enter your bank password "
        "to claim it.",
        "Your account is suspended, send your login and PIN to verify your identity.",
        "Double your bitcoin in 24 hours, guaranteed returns, just send 0.1 BTC first.",
        "Pay the customs fee with iTunes gift cards to release your parcel."]
NEUTRAL = ["The weather is lovely today, let's go for a walk in the park.",
           "Our bakery has fresh croissants every morning.",
           "The quarterly meeting is moved to Thursday at 10am.",
           "This recipe uses two cups of flour and three eggs.",
           "The football match ended in a draw.",
           "Kill the process with Ctrl+C if it hangs.",
           "The band shot their new music video in Berlin."]
# The shipped example's text-only policy: the ranking tests check its label descriptions.
EXAMPLE = Path(__file__).resolve().parents[5] / "deploy" / "config.example.toml"
POLICY: PolicySettings = load_config(EXAMPLE).moderation.policies["captions"]
