from agentrl_cli.cli.app import main

main()
