"""Configuration spaces: :class:`~tiletune.space.spaces.Space` and its configs, lazily enumerated
spaces, the search strategies over them and the per-kernel-type templates."""
