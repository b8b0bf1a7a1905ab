"""perfsuite measuring itself (``perfsuite selftest``): the verdicts' false
alarms and power (detection.py), ``perfsuite ab``'s error rates on this
runner (error_rates.py), the suite's own cost per step (overhead.py) and
where a launch's time goes (launchcost.py). Runs sessions of the suite like
any user would: the last step of the data flow."""
