from agentrl_cli.app import main

main()
