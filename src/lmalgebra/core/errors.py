"""The one exception type for bad user input: the CLI prints its message on one line and exits 2."""


class UserInputError(Exception):
    """Input a user gave is unusable; the message names the culprit."""


class TrainingDivergedError(RuntimeError):
    """The training loss became NaN or infinite; the last good checkpoint is kept."""
