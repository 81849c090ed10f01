from holdover.cli import main

main()
