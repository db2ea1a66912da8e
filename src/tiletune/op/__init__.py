"""The tuned op: the ``@autotune`` decorator, its hot path (guards, cached launchers), argument binding
and the events listeners subscribe to. Everything a call needs before and after a miss; the miss
itself is answered by :mod:`tiletune.resolve`."""
