print('usage: tool.py')
print('To save the version, run:')
print('echo', '.'.join(map(str, (7, 12, 2))), '> version.txt')
