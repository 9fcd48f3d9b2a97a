print('usage: tool.py')
print('To save the version, run:')
print('echo', '.'.join(map(str, (4, 1, 9))), '> version.txt')
