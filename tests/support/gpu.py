"""The gpu tier's mark: a test that needs CUDA runs where it is, and says why it skips elsewhere."""

import pytest
import torch

cuda = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device here: the gpu tier runs where one is (make gpu-check)"
)
