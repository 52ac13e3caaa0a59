"""The models are built on first use (`defer_build`): make sure every one of them does build, so a
bad annotation fails here and not at the first frame of that type in a daemon."""

import subprocess
import sys

import pytest

from protocol import messages
from protocol.messages import Outcome, OutputTail, Rpc


def test_every_model_builds_and_the_lazy_defaults_are_the_eager_ones():
    messages.build_all()
    models = [v for v in vars(messages).values() if isinstance(v, type) and issubclass(v, messages.Message)]
    assert len(models) > 40
    assert all(m.__pydantic_complete__ for m in models if m is not messages.Message)
    assert Outcome.model_fields["stdout"].default == OutputTail()
    rpc = Rpc.model_validate(
        {"run_id": "r1", "tool": "exec", "args": {}, "timeout_ms": 5, "background": {"max_runtime_ms": 9}}
    )
    assert rpc.background.max_runtime_ms == 9  # the forward reference resolved


@pytest.mark.slow
def test_importing_the_models_builds_none_of_them():
    code = "import protocol.messages as m; print(sum(c.__pydantic_complete__ for c in m.MESSAGE_TYPES.values()))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "0"
