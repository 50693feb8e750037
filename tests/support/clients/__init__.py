"""Programs written for torchrun by nobody here, as users write them: the real-client tier
(tests/clients/test_real_clients.py) runs them through the kit, unchanged."""
