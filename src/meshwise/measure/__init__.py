"""Prediction beside reality: run a layout for a few steps, measure memory, communication and time
per rank with PyTorch's own tools, and compare with what the cost model predicts (``compare``);
microbenchmark the machine into a profile the planner uses (``calibrate``)."""
