from lmalgebra.cli import main

main()
