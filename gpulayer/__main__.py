from gpulayer.cli import main

main()
