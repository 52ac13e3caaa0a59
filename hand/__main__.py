from hand.cli import main

raise SystemExit(main())
