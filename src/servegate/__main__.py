from servegate.cli import main

raise SystemExit(main())
