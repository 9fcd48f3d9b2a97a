print('usage: tool.py')
print('To save the version, run:')
print('echo', '.'.join(map(str, (2, 10, 6))), '> version.txt')
