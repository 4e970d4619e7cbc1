"""What the fork server that starts a world's ranks imports once (`launcher`): torch, the virtual device and the
SGLang modules every rank imports. Each rank then forks from it with them imported, instead of importing them anew
as a spawned interpreter does (about 4 s a rank on 2 cores). Nothing here runs a torch op, starts a thread or
builds SGLang state: a forked rank starts as clean as a spawned one. The imported heap is frozen last
(`gc_policy`): a rank inherits it frozen, so its first collection does not scan it either."""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from harness.compat import prepare_torchvision  # noqa: E402 - before anything imports transformers

prepare_torchvision()

import harness.devices.cpu  # noqa: E402,F401
import harness.targets.worlds.serving  # noqa: E402,F401
import sglang.srt.distributed.bootstrap  # noqa: E402,F401
import sglang.srt.managers.scheduler_components.dp_attn  # noqa: E402,F401
import sglang.srt.model_executor.model_runner  # noqa: E402,F401
import sglang.srt.model_executor.runner.decode_cuda_graph_runner  # noqa: E402,F401
import sglang.srt.model_executor.runner.eager_runner  # noqa: E402,F401
# the model registry imports every model class SGLang ships (1.6 s a rank); checked to start no thread, initialise
# no device and leave every module's `_is_cuda`/`_is_npu`-style flag as an import under the virtual device does
import sglang.srt.models.registry  # noqa: E402,F401

from harness.devices.gc_policy import freeze_heap  # noqa: E402

freeze_heap("cpu")
