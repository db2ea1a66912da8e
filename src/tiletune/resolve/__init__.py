"""The miss path: a miss becomes one :class:`~tiletune.resolve.problem.Problem`, an ordered chain of
sources turns it into a :class:`~tiletune.resolve.problem.Choice` (capture, disabled/single, pins,
database with its lease, shipped tables, nearest known neighbour, peers, tune), and the chain stores
the answer once."""
