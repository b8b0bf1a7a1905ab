"""The built-in workloads a rank runs: MobileNetV2 on images, torchtune's
LLM recipes, and the pre-flight probe. Inside a rank, the second floor of the
data flow: a workload gets its cell and rank context and hands the worker its
steps."""
