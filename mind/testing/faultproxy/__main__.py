from mind.testing.faultproxy.cli import main

main()
