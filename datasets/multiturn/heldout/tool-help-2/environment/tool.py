print('usage: tool.py')
print('To save the version, run:')
print('echo', '.'.join(map(str, (3, 15, 2))), '> version.txt')
