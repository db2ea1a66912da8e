"""The search loop: a strategy proposes configs, the devices evaluate them (compile, check, time), the
loop ranks the leaders in one interleaved showdown."""
