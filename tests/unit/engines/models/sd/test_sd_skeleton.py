"""Uninitialised skeletons (for loading a cached state dict) equal initialised ones once the
state dict is loaded, buffers included, and leave parameter initialisation working after."""

from __future__ import annotations

import pytest

from tests.unit.tasks.generation.gen_support import needs_sd


@needs_sd
@pytest.mark.parametrize("component", ["text_encoder", "unet", "vae"])
def test_uninitialised_skeleton_loads_to_the_same_module(component: str) -> None:
    import torch

    from engines.models.sd.arch import ARCHES
    from engines.models.sd.nets import skeleton
    from engines.models.sd.weights import RandomSdWeights

    weights = RandomSdWeights(ARCHES["tiny"], 0)
    reference = weights.load(component, "cpu")
    net = skeleton(component, weights.config(component), "cpu", initialised=False)
    net.load_state_dict(reference.state_dict(), strict=True)
    for name, value in reference.state_dict().items():
        assert torch.equal(net.state_dict()[name], value), name
    # Buffers outside the state dict are computed, not initialised (the in-house nets have
    # none today; this keeps it true if one is added).
    ref_buffers, buffers = dict(reference.named_buffers()), dict(net.named_buffers())
    assert ref_buffers.keys() == buffers.keys()
    for name, value in ref_buffers.items():
        assert torch.equal(buffers[name], value), name
    # Same inputs, same outputs.
    feeds = {"text_encoder": (torch.randint(0, 100, (1, 77)),),
             "unet": (torch.randn(1, 4, 8, 8), torch.tensor([10.0]),
                      torch.randn(1, 77, weights.dims().text_hidden)),
             "vae": (torch.randn(1, 4, 8, 8),)}[component]
    with torch.no_grad():
        assert torch.equal(net(*feeds), reference(*feeds))
    # Initialisation is restored for everything built afterwards.
    torch.manual_seed(0)
    assert torch.nn.Linear(8, 8).weight.detach().abs().sum() > 0
