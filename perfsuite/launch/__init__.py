"""The host side of a cell: its launch on N ranks through torch.distributed.run
(one node or many), how the ranks start, the pre-flight probe, and why a launch
failed. The data flow's third floor: it starts what runs inside the ranks and
hands their records to perfsuite.results."""
