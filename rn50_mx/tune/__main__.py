from . import main_cli

main_cli()
