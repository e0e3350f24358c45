"""Fixed sentences and a policy for the real-weights text tests (plainly violent, plainly scams,
plainly neutral; the neutral ones include violent and scam *words* used harmlessly)."""

from __future__ import annotations

from worker.policy_settings import PolicySettings

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
POLICY = PolicySettings(models=["text"], labels={
    "violence": {"descriptions": ["threatening to hurt or kill someone",
                                  "a violent attack: stabbing, shooting or beating people",
                                  "graphic gore, blood and injuries"]},
    "scam": {"descriptions": ["you won a prize, send your bank details to claim it",
                              "asking for your password, PIN or login to verify your account",
                              "guaranteed investment returns, send money first",
                              "pay a fee with gift cards"]},
})
