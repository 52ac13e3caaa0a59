from mind.main import main

main()
