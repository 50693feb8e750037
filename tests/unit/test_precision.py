"""The GPU paths' CPU side: what the trainer refuses on a CPU before it trains (the gpu tier,
tests/gpu/, runs the rest where CUDA is)."""

import pytest
import torch

from train.config import Config, load


def test_fp16_is_refused_on_the_cpu_before_training():
    from train.config import ConfigError
    from train.loop import check_supported

    with pytest.raises(ConfigError) as err:
        check_supported(load(Config, None, ["train.precision=fp16"]), torch.device("cpu"))
    assert err.value.key == "train.precision"
