from simagent.cli import entry

entry()
