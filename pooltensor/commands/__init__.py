"""The subcommands of the ``pooltensor`` command beyond ``serve``, one module each: ``info``,
``stats`` (a metrics endpoint, once or live), ``bench`` and ``store`` (the tensor stores
on memory servers). Each module has add_parser(sub),
which registers its parser with set_defaults(run=its function); pooltensor/cli.py only wires
them. ``checks`` holds the general checks that ``doctor`` (pooltensor/doctor.py) runs."""
