"""The one base class for mistakes in what the user gave perfcast (a flag, a file, a design
point), as opposed to bugs: the CLI turns a :class:`UserError` into one line and exit code 2."""


class UserError(ValueError):
    pass
