"""`python -m compiler` is `qrc`."""

from compiler.cli import main

main()
