from hetsim.cli import console_main

console_main()
