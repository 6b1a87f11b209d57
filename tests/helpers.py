"""Helpers shared by test modules (imported as `helpers`: pytest puts this folder on sys.path)."""

import torch


def randomize_hf(model, scale: float):
    """Hugging Face's init leaves norms at 1 and biases at 0, which would hide a swapped mapping:
    norm gains become 1 + N(0, 0.2), norm biases N(0, 0.2), every other tensor N(0, scale)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1 and ("norm" in name or ".ln_" in name):
                p.copy_(1 + 0.2 * torch.randn_like(p) if name.endswith("weight") else 0.2 * torch.randn_like(p))
            else:
                p.copy_(scale * torch.randn_like(p))
    return model.eval()
