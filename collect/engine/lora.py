"""LoRA adapters on one base model (peft multi-adapter), loaded and unloaded at runtime.

Every method here runs on the batcher's thread (between generation steps), so the model never
changes under a running forward pass. An adapter is checked before peft touches the model: a bad
one is refused with the model left as it was.
"""
from __future__ import annotations

from wharf.adapters import AdapterInvalid, AdapterNotFound, check_adapter  # noqa: F401  (server's names)


class Adapters:
    def __init__(self, base_model, max_loras: int):
        self.base = base_model
        self.peft = None
        self.paths: dict[str, str] = {}
        self.max_loras = max_loras

    @property
    def model(self):
        return self.peft if self.peft is not None else self.base

    def load(self, name: str, path: str, inplace: bool) -> None:
        from peft import PeftModel

        check_adapter(name, path, self.base)
        if name not in self.paths and len(self.paths) >= self.max_loras:
            raise AdapterInvalid(f"Loading lora {name} failed: {len(self.paths)} adapters are loaded, "
                                 f"the limit is engine.max_loras={self.max_loras}; unload one first")
        if name in self.paths:
            self.unload(name)
        try:
            if self.peft is None:
                self.peft = PeftModel.from_pretrained(self.base, path, adapter_name=name, is_trainable=False)
            else:
                self.peft.load_adapter(path, adapter_name=name, is_trainable=False)
        except Exception as e:
            raise AdapterInvalid(f"Loading lora {name} failed: {type(e).__name__}: {e}") from None
        self.peft.eval()
        self.paths[name] = path

    def unload(self, name: str) -> None:
        del self.paths[name]
        if not self.paths:
            # The last adapter: take the LoRA layers out again so the base runs at full speed.
            self.base = self.peft.unload()
            self.peft = None
        else:
            self.peft.delete_adapter(name)
