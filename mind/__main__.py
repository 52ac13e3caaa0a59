from mind.cli import main

main()
