"""``perfsuite doctor``: what the machine says, and what will and will not
work on it, per tier. A front door, the last step of the data flow: it asks
the floors below it before anything is measured."""
