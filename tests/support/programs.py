"""What the tests of programs in several tiers share (tests/*/test_programs.py)."""

CNN = "program.script=jobs/train_cnn.py"
